"""The larql version: a leaf, so that the vindex writer can stamp it without importing the facade."""

__version__ = "0.1.0"
