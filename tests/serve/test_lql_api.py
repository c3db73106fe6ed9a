"""/v1/health, /v1/info, /v1/lql and the shortcuts against a real server: the same JSON as
`larql lql --json`, the CLI's error messages, read-only by default, and limits."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx

from larql.lql.executor import execute
from larql.serve.config import Limits
from tests.cli.conftest import larql
from tests.serve.conftest import Serve


def _same(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results without their timings (the only field that differs run to run)."""
    return [{k: v for k, v in r.items() if k != "elapsed_ms"} for r in results]


def _local(vx: Path, text: str) -> list[dict[str, Any]]:
    """What the local executor gives, as `larql lql --json` writes it."""
    return _same([json.loads(json.dumps(r.to_json(), default=str)) for r in execute(f'USE "{vx}"; {text}')[1:]])


def lql(url: str, query: str, **kw: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/lql", json={"query": query}, timeout=60, **kw)


def test_health_and_info(browse: str) -> None:
    assert httpx.get(f"{browse}/v1/health").json() == {"status": "ok", "version": "0.1.0"}
    info = httpx.get(f"{browse}/v1/info").json()
    assert (info["kind"], info["layers"], info["features"], info["hidden"], info["level"]) == \
        ("vindex", 4, 4 * 96, 64, "browse")
    assert info["allow_edits"] is False and info["patches"] == [] and info["session"] is None


def test_lql_answers_what_larql_lql_json_prints(browse: str, browse_vx: Path) -> None:
    text = 'DESCRIBE "hello"; WALK "hello" TOP 2 LAYERS 1-2; SELECT * FROM EDGES WHERE layer = 2 LIMIT 4; SHOW LAYERS'
    r = lql(browse, text)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    got = _same(r.json()["results"])
    assert [g["statement"] for g in got] == ['DESCRIBE "hello"', 'WALK "hello" TOP 2 LAYERS 1-2',
                                             "SELECT * FROM EDGES WHERE layer = 2 LIMIT 4", "SHOW LAYERS"]
    assert len(got[2]["rows"]) == 4 and [row[0] for row in got[3]["rows"]] == [0, 1, 2, 3]
    cli = larql("lql", "--json", "--vindex", str(browse_vx), text)
    assert cli.returncode == 0, cli.stderr
    assert got == _same([json.loads(line) for line in cli.stdout.splitlines()])


def test_inference_statements_match_local(infer: str, infer_vx: Path) -> None:
    text = 'INFER "hello" TOP 3; TRACE "hello" FOR "x"; EXPLAIN INFER "hi"'
    r = lql(infer, text)
    assert r.status_code == 200, r.text
    got = _same(r.json()["results"])
    assert got == _local(infer_vx, text)
    assert got[0]["columns"] == ["rank", "token", "prob", "logit"] and len(got[0]["rows"]) == 3
    # unrounded: the tiny model's p(" x") is far below 5e-5 at every stage, and not 0
    assert all(0.0 < row[2] < 5e-5 for row in got[1]["rows"]) and got[1]["columns"][2] == "prob"


def test_errors_carry_the_cli_message_and_caret(browse: str, browse_vx: Path) -> None:
    r = lql(browse, 'SHOW LAYERS;\nDESCRIBE France')
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "LqlSyntaxError" and (err["line"], err["column"]) == (2, 10)
    cli = larql("lql", "--vindex", str(browse_vx), 'SHOW LAYERS;\nDESCRIBE France')
    assert cli.stderr == f"larql: LqlSyntaxError: {err['message']}\n"
    assert err["message"].endswith("  DESCRIBE France\n           ^")
    r = lql(browse, "SHOW FEATURES 9")  # a semantic error: results before it are kept
    assert r.status_code == 400 and r.json()["error"]["detail"].startswith("layer 9 is out of range")
    r = lql(browse, 'SHOW LAYERS 0-0; SELECT * FROM EDGES WHERE colour = "red"')
    body = r.json()
    assert [x["statement"] for x in body["results"]] == ["SHOW LAYERS 0-0"]
    assert body["error"]["detail"] == "unknown field 'colour' for this source"
    r = httpx.post(f"{browse}/v1/lql", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("the request body is not JSON")
    r = httpx.post(f"{browse}/v1/lql", json={"q": "x"})
    assert r.status_code == 400 and '"query"' in r.json()["error"]["message"]
    r = httpx.get(f"{browse}/v1/nothing")
    assert r.status_code == 404 and r.json()["error"] == {"type": "NotFound", "message": "GET /v1/nothing: Not Found"}
    r = httpx.get(f"{browse}/v1/lql")
    assert r.status_code == 405 and r.json()["error"]["type"] == "MethodNotAllowed"


def test_read_only_by_default_and_nothing_changes(browse: str) -> None:
    before = lql(browse, "SELECT * FROM FEATURES WHERE layer = 0 AND feature = 1").json()["results"]
    r = lql(browse, "SHOW LAYERS; DELETE FROM EDGES WHERE layer = 0 AND feature = 1")
    assert r.status_code == 403 and r.json()["error"]["type"] == "AccessError"
    assert "read-only" in r.json()["error"]["message"] and "results" not in r.json()  # refused before any ran
    for write in ['APPLY PATCH "p.vlp"', 'BEGIN PATCH "p.vlp"', 'COMPILE CURRENT INTO VINDEX "c.vindex"',
                  'UPDATE EDGES SET confidence = 1.0 WHERE layer = 0 AND feature = 1']:
        assert lql(browse, write).status_code == 403, write
    after = lql(browse, "SELECT * FROM FEATURES WHERE layer = 0 AND feature = 1").json()["results"]
    assert _same(after) == _same(before) and before[0]["rows"][0][2] != ""
    assert httpx.get(f"{browse}/v1/info").json()["edited_features"] == 0


def test_use_and_extract_are_refused(browse: str) -> None:
    for text, kind in [('USE "other.vindex"', "USE"), ('EXTRACT MODEL "x" INTO "y.vindex"', "EXTRACT")]:
        r = lql(browse, text)
        assert r.status_code == 400 and r.json()["error"]["detail"] == \
            f"{kind} is not available on a server: it serves one vindex or model"


def test_shortcuts_equal_their_statements(browse: str, infer: str) -> None:
    d = httpx.get(f"{browse}/v1/describe", params={"entity": "hello", "verbose": "true"}).json()
    assert d["statement"] == 'DESCRIBE "hello" VERBOSE'
    assert _same([d]) == _same(lql(browse, 'DESCRIBE "hello" VERBOSE').json()["results"])
    w = httpx.post(f"{browse}/v1/walk", json={"prompt": "hello", "top": 2, "layers": "1-2"}).json()
    assert w["statement"] == 'WALK "hello" TOP 2 LAYERS 1-2' and {row[0] for row in w["rows"]} == {1, 2}
    i = httpx.get(f"{infer}/v1/infer", params={"prompt": "hello", "top": "2"}).json()
    assert i["statement"] == 'INFER "hello" TOP 2' and len(i["rows"]) == 2
    t = httpx.get(f"{infer}/v1/trace", params={"prompt": "hello", "for": "x", "layers": "0-1"}).json()
    assert t["statement"] == 'TRACE "hello" FOR "x" LAYERS 0-1'
    r = httpx.get(f"{browse}/v1/walk", params={"prompt": "hello", "top": "many"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "top must be an integer, got 'many'"
    assert httpx.get(f"{browse}/v1/describe").json()["error"]["message"] == "the parameter 'entity' is required"


def test_limits(serve: Serve, browse_vx: Path) -> None:
    with serve(browse_vx, limits=Limits(max_body_bytes=200, max_statements=3, timeout_s=0.0)) as url:
        r = lql(url, "SHOW LAYERS; " * 4)
        assert r.status_code == 413 and r.json()["error"] == {
            "type": "LimitError", "message": "4 statements in one request; this server runs at most 3"}
        r = lql(url, f'DESCRIBE "{"x" * 300}"')
        assert r.status_code == 413 and "over this server's limit of 200 bytes" in r.json()["error"]["message"]
        r = lql(url, "SHOW LAYERS")  # a zero time limit: refused at the first statement
        assert r.status_code == 504 and r.json()["error"]["type"] == "LimitError"


def test_concurrent_clients_get_the_same_answers(infer: str) -> None:
    text = 'INFER "hello" TOP 3; TRACE "hi" FOR "x"'
    want = _same(lql(infer, text).json()["results"])
    got: list[Any] = [None] * 8

    def client(i: int) -> None:
        got[i] = _same(lql(infer, text).json()["results"])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 8


def test_answers_are_not_held_back_by_nagle(browse: str) -> None:
    """A response's body must not wait for the client's delayed ACK (~40 ms): the server's sockets
    need TCP_NODELAY, which asyncio sets only on sockets made with proto IPPROTO_TCP."""
    import http.client
    import time
    from urllib.parse import urlsplit

    u = urlsplit(browse)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        conn.request("GET", "/v1/health")
        assert conn.getresponse().read() == b'{"status": "ok", "version": "0.1.0"}'
        times.append(time.perf_counter() - t0)
    assert sorted(times)[10] < 0.02  # ~0.5 ms here; 40+ ms with Nagle
