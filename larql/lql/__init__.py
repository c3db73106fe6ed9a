"""LQL: grammar -> AST -> plan -> execute."""

from __future__ import annotations

from larql.lql.ast import Statement
from larql.lql.parser import parse, parse_one
from larql.lql.unparse import unparse

__all__ = ["Statement", "parse", "parse_one", "unparse"]
