"""USE REMOTE: statements run on a real server and come back as the same Results a local vindex
gives; writes follow the server's rules; the CLI renders remote results as it renders local ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from larql.errors import LqlSemanticError, LqlSyntaxError
from larql.lql.executor import execute
from larql.lql.result import Result
from larql.lql.session import Session
from tests.cli.conftest import larql
from tests.serve.conftest import Serve

BROWSE_READS = ['DESCRIBE "hello"', 'DESCRIBE "hello" VERBOSE', 'WALK "hello" TOP 3 LAYERS 1-3',
                "SELECT * FROM EDGES WHERE layer = 2 ORDER BY score DESC LIMIT 5",
                'SELECT * FROM EDGES NEAREST TO "abc" AT LAYER 1 LIMIT 4', "SELECT * FROM ENTITIES LIMIT 5",
                "SHOW LAYERS", "SHOW FEATURES 3 LIMIT 4", "SHOW RELATIONS", "STATS"]
INFER_READS = ['INFER "hello" TOP 4', 'TRACE "hello" FOR "x"', 'TRACE "hello there" DECOMPOSE',
               'EXPLAIN INFER "hi" TOP 2']


def rows(results: list[Result]) -> list[dict[str, Any]]:
    """What a result shows, as JSON carries it (tuples become lists), without the timing."""
    return [{k: v for k, v in json.loads(json.dumps(r.to_json(), default=str)).items() if k != "elapsed_ms"}
            for r in results]


def test_reads_give_the_local_rows(browse: str, browse_vx: Path, infer: str, infer_vx: Path) -> None:
    for url, vx, reads in [(browse, browse_vx, BROWSE_READS), (infer, infer_vx, INFER_READS)]:
        text = "; ".join(reads)
        remote = execute(f'USE REMOTE "{url}"; {text}')
        assert remote[0].notes[0].startswith(f"Using: remote {url} (4 layers, 384 features, model: m.gguf")
        local = execute(f'USE "{vx}"; {text}')[1:]
        assert rows(remote[1:]) == rows(local) and len(local) == len(reads)
        stats = {row[0]: row[1] for row in remote[-1].rows} if vx == browse_vx else {}
        assert vx != browse_vx or stats["layers"] == 4


def test_errors_are_located_in_the_local_text(browse: str) -> None:
    session = Session()
    execute(f'USE REMOTE "{browse}"', session)
    with pytest.raises(LqlSemanticError) as e:
        execute("SHOW LAYERS;\n  SHOW FEATURES 9", session)
    assert (e.value.line, e.value.column) == (2, 3)
    assert e.value.message == "layer 9 is out of range: this vindex has layers 0-3"
    assert e.value.hint == "use a layer between 0 and 3"
    with pytest.raises(LqlSemanticError) as e:
        execute("DELETE FROM EDGES WHERE layer = 0 AND feature = 1", session)
    assert e.value.message.startswith(f"{browse}: this server is read-only")
    with pytest.raises(LqlSyntaxError):  # parsed locally: nothing is sent
        execute("DESCRIBE France", session)
    with pytest.raises(LqlSemanticError, match="cannot reach the server"):
        execute('USE REMOTE "http://127.0.0.1:9"')


def test_writes_use_the_token_and_stay_in_this_clients_session(serve: Serve, browse_vx: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(browse_vx, tmp_path / "b.vindex")
    feature = "SELECT * FROM FEATURES WHERE layer = 0 AND feature = 1"
    deleted = execute(f'USE "{browse_vx}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 1; {feature}')[2]
    with serve(tmp_path / "b.vindex", root=tmp_path, allow_edits=True, token="tok") as url:
        monkeypatch.delenv("LARQL_TOKEN", raising=False)
        with pytest.raises(LqlSemanticError) as e:
            execute(f'USE REMOTE "{url}"; DELETE FROM EDGES WHERE layer = 0 AND feature = 1')
        assert "Authorization: Bearer" in e.value.message and e.value.hint == "set LARQL_TOKEN to the server's token"
        monkeypatch.setenv("LARQL_TOKEN", "tok")
        mine, other = Session(), Session()
        execute(f'USE REMOTE "{url}"; BEGIN PATCH "p.vlp"; DELETE FROM EDGES WHERE layer = 0 AND feature = 1', mine)
        assert rows(execute(feature, mine))[0]["rows"] == rows([deleted])[0]["rows"]
        original = execute(f'USE "{browse_vx}"; {feature}')[1]
        assert rows(execute(f'USE REMOTE "{url}"; {feature}', other)[1:])[0]["rows"] == rows([original])[0]["rows"]
        (saved,) = execute("SAVE PATCH", mine)
        assert saved.title.startswith(f"Saved: {tmp_path.resolve() / 'p.vlp'} (")
        assert json.loads((tmp_path / "p.vlp").read_text())["operations"][0]["op"] == "delete"


def test_the_cli_renders_remote_results_as_local(browse: str, browse_vx: Path) -> None:
    text = 'DESCRIBE "hello"; WALK "hello" TOP 2 LAYERS 0-1; SHOW LAYERS'
    remote = larql("lql", "--width", "150", f'USE REMOTE "{browse}"; {text}')
    local = larql("lql", "--width", "150", "--vindex", str(browse_vx), text)
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    first, rest = remote.stdout.split("\n", 1)
    assert first.startswith(f"  Using: remote {browse}") and rest == local.stdout and "┃ layer" in rest
