"""Framework integrations (SQLAlchemy, FastAPI, ...); each imports its framework lazily."""
