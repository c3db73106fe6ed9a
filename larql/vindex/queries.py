"""DESCRIBE, WALK and NEAREST as methods of whatever reads a vindex (the store and an editable view
alike): `v.describe("France")`, `v.walk("The capital of France is")`, `v.nearest("France", layer=10)`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from larql.vindex.browse import FeatureHit, WalkResult
    from larql.vindex.describe import DescribeResult
    from larql.vindex.reader import VindexReader


class VindexQueries:
    """The browsing verbs, for a class that satisfies `VindexReader`."""

    def describe(self: VindexReader, entity: str, **options: Any) -> DescribeResult:
        """What the vindex knows about `entity`: feature edges by layer band, and probe edges when a
        model is given (`model=`; `larql.vindex.describe.describe` lists every option)."""
        from larql.vindex.describe import describe

        return describe(self, entity, **options)

    def walk(self: VindexReader, prompt: str, top: int = 10, layers: tuple[int, int] | list[int] | None = None,
             n_down: int = 3) -> WalkResult:
        """The features whose gates the prompt's last token fires most, layer by layer (no inference)."""
        from larql.vindex.browse import walk

        return walk(self, prompt, top, layers, n_down)

    def nearest(self: VindexReader, entity: str, layer: int, limit: int = 20) -> list[FeatureHit]:
        """The `limit` features at `layer` whose gates are nearest the entity's embedding."""
        from larql.vindex.browse import nearest

        return nearest(self, entity, layer, limit)
