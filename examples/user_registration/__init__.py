"""The user-registration example: register a user and welcome them by e-mail, exactly once.

See README.md in this directory.
"""
