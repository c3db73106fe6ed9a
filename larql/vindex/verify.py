"""`larql verify`: the checks opening makes, with every file read again (no cache), every damaged
file listed rather than the first, and model_config compared with the source model's own metadata
when that model is still where it was extracted from. `repair` re-extracts from that source (or
converts again the LARQL vindex a converted one came from)."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from larql.errors import LarqlError, VindexError
from larql.io.jsonfile import read_json
from larql.model.config import ModelConfig
from larql.vindex import check, integrity


@dataclass
class VerifyReport:
    path: Path
    files: int = 0  # files hashed
    bad_files: list[str] = field(default_factory=list)
    config_diffs: list[str] = field(default_factory=list)  # model_config fields that differ from the source
    source_note: str = ""  # how (or why not) the config was compared with the source model

    @property
    def ok(self) -> bool:
        return not self.bad_files and not self.config_diffs


def _source(index: dict[str, Any]) -> tuple[Path | None, str]:
    """The source model if it is still there and still the same bytes, else None and why not."""
    from larql.vindex.integrity import sha256_path

    src = Path(index["source"]["path"])
    if not src.exists():
        return None, f"source {src} is gone; model_config not compared"
    digest, size = sha256_path(src)
    if size != index["source"]["size"] or digest != index["source"]["sha256"]:
        return None, f"source {src} has changed since extraction; model_config not compared"
    return src, f"model_config matches the source {src}"


def _config_diffs(index: dict[str, Any], src: Path) -> list[str]:
    from larql.model.load import load_path

    # a field this index.json lacks has its default (fields added later; rope_freq_factors when empty)
    defaults = {f.name: list(f.default) if isinstance(f.default, tuple) else f.default
                for f in fields(ModelConfig) if f.default is not MISSING}
    ours = {**defaults, **index["model_config"]}
    theirs = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(load_path(src.name, src).config).items()}
    return [f"model_config.{k}: {ours.get(k)!r} here, {v!r} in the source" for k, v in theirs.items()
            if ours.get(k) != v]


def converted(src: Path) -> bool:
    """Whether a vindex's source is a vindex: only a LARQL vindex converted by `larql convert` is."""
    return (src / "index.json").is_file()


def verify_vindex(path: str | Path) -> VerifyReport:
    """Check a vindex thoroughly. Raises VindexError when index.json itself is unusable (it is the
    root of every other check); reports damaged files and config differences otherwise."""
    path = Path(path)
    index = check.load_index(path)
    report = VerifyReport(path, files=len(index["files"]))
    report.bad_files = integrity.check_contents(path, index, use_cache=False)
    if "compiled_from" in index:
        report.source_note = "a compiled vindex: its model_config is its base's, not compared with a source"
        return report
    src, report.source_note = _source(index)
    if src is not None and converted(src):
        report.source_note = f"converted from the LARQL vindex {src} (unchanged); model_config not compared"
    elif src is not None:
        try:
            report.config_diffs = _config_diffs(index, src)
        except LarqlError as e:
            report.source_note = f"source {src} could not be read ({e}); model_config not compared"
    return report


def repair(path: str | Path) -> Path:
    """Re-extract a vindex in place from its source model, with the options it was extracted with.

    Needs index.json readable and the source unchanged (its sha256 is in index.json); a compiled
    vindex cannot be rebuilt this way (its edits live in the patches it was compiled from).
    """
    from larql.vindex.extract import extract

    path = Path(path)
    index = read_json(path / "index.json", check.MAX_INDEX_BYTES, check.MAX_JSON_DEPTH, "vindex index")
    check.validate_index(index, str(path / "index.json"))
    if "compiled_from" in index:
        raise VindexError(f"{path}: a compiled vindex cannot be re-extracted; {integrity.repair_hint(index, path)}")
    src, why = _source(index)
    if src is None:
        raise VindexError(f"{path}: cannot repair: {why.split(';')[0]}; extract it again from the model")
    if converted(src):
        from larql.vindex.larql_import import convert_larql

        return convert_larql(src, path, dtype=index["dtype"], level="browse", overwrite=True)
    return extract(src, path, level=index["extract_level"], dtype=index["dtype"],
                   quant="source" if index["quant"] == "none" else index["quant"], top_k=index["down_top_k"],
                   overwrite=True)
