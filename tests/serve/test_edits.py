"""Edits over HTTP: --allow-edits, the token, each client's own session overlay, paths kept under
the server's directory."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from larql.lql.executor import execute
from tests.serve.conftest import Serve

TOKEN = "s3cret-token"
FEATURE = "SELECT * FROM FEATURES WHERE layer = 0 AND feature = 1"
DELETE = "DELETE FROM EDGES WHERE layer = 0 AND feature = 1"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, browse_vx: Path) -> Path:
    """The server's working directory: a copy of the vindex and a patch outside it."""
    root = tmp_path_factory.mktemp("serve-root")
    shutil.copytree(browse_vx, root / "b.vindex")
    (root.parent / "outside.vlp").write_text("{}")
    return root


@pytest.fixture(scope="module")
def url(serve: Serve, root: Path) -> Iterator[str]:
    with serve(root / "b.vindex", root=root, allow_edits=True, token=TOKEN) as url:
        yield url


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def lql(url: str, query: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/lql", json={"query": query}, headers=headers or {}, timeout=60)


def token_of_feature(url: str, headers: dict[str, str] | None = None) -> str:
    r = lql(url, FEATURE, headers)
    assert r.status_code == 200, r.text
    return str(r.json()["results"][0]["rows"][0][2])


def test_writes_need_the_token(url: str) -> None:
    original = token_of_feature(url)
    r = lql(url, DELETE)
    assert r.status_code == 401 and r.json()["error"]["type"] == "AccessError"
    assert "Authorization: Bearer" in r.json()["error"]["message"] and "x-larql-session" not in r.headers
    r = lql(url, DELETE, {"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["message"] == "wrong token in 'Authorization: Bearer ...'"
    assert token_of_feature(url) == original and httpx.get(f"{url}/v1/info").json()["edited_features"] == 0


def _after_locally(vx: Path, edit: str) -> str:
    """The feature's token after `edit`, run by the local executor."""
    return str(execute(f'USE "{vx}"; {edit}; {FEATURE}')[2].rows[0][2])


def test_each_client_edits_its_own_overlay(url: str, root: Path) -> None:
    original = token_of_feature(url)
    deleted = _after_locally(root / "b.vindex", DELETE)
    updated = _after_locally(root / "b.vindex", 'UPDATE EDGES SET target = "zz" WHERE layer = 0 AND feature = 1')
    assert len({original, deleted, updated}) == 3
    a = lql(url, DELETE, AUTH)
    assert a.status_code == 200 and a.json()["results"][0]["title"] == "Deleted 1 feature(s) (patch overlay)"
    sid_a = a.headers["x-larql-session"]
    assert a.json()["session"] == sid_a and f"larql_session={sid_a}" in a.headers["set-cookie"]
    as_a = {"X-Larql-Session": sid_a}
    assert token_of_feature(url, as_a) == deleted
    assert token_of_feature(url) == original  # a client with no session sees the vindex as it is
    b = lql(url, 'UPDATE EDGES SET target = "zz" WHERE layer = 0 AND feature = 1', AUTH)
    sid_b = b.headers["x-larql-session"]
    assert sid_b != sid_a and token_of_feature(url, {"X-Larql-Session": sid_b}) == updated
    assert token_of_feature(url, as_a) == deleted  # b's update did not reach a
    info = httpx.get(f"{url}/v1/info", headers=as_a).json()
    assert (info["session"], info["edited_features"], info["unsaved_edits"]) == (sid_a, 1, 1)
    with httpx.Client(base_url=url, cookies={"larql_session": sid_a}) as c:  # the cookie works as the header does
        assert c.post("/v1/lql", json={"query": FEATURE}).json()["results"][0]["rows"][0][2] == deleted
    assert httpx.request("DELETE", f"{url}/v1/session", headers=as_a).json() == {"dropped": sid_a}
    r = lql(url, FEATURE, as_a)
    assert r.status_code == 404 and r.json()["error"]["type"] == "UnknownSession"


def test_patches_are_written_under_the_server_directory(url: str, root: Path) -> None:
    r = lql(url, f'BEGIN PATCH "mine.vlp"; {DELETE}; SAVE PATCH', AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["statement"] == 'BEGIN PATCH "mine.vlp"'  # as written, not anchored
    saved = json.loads((root / "mine.vlp").read_text())
    assert saved["operations"] == [{"op": "delete", "layer": 0, "feature": 1, "reason": "DELETE 1 slot(s)"}]
    sid = {"X-Larql-Session": r.headers["x-larql-session"], **AUTH}
    r = lql(url, 'REMOVE PATCH "mine.vlp"; APPLY PATCH "mine.vlp"; SHOW PATCHES', sid)
    assert r.status_code == 200, r.text
    assert r.json()["results"][2]["rows"][0][1] == "mine.vlp"
    os.symlink(root.parent / "outside.vlp", root / "link.vlp")
    for path in ["../outside.vlp", str(root.parent / "outside.vlp"), "link.vlp", "sub/../../outside.vlp"]:
        r = lql(url, f'SHOW PATCHES; APPLY PATCH "{path}"', sid)
        err = r.json()["error"]
        assert r.status_code == 400 and err["detail"] == f"{path}: outside the server's directory {root.resolve()}"
        assert (err["line"], err["column"]) == (1, 15) and "results" not in r.json()  # checked before anything ran
    r = lql(url, 'COMPILE CURRENT INTO VINDEX "/tmp/elsewhere.vindex"', sid)
    assert r.status_code == 400 and "outside the server's directory" in r.json()["error"]["detail"]
    assert not Path("/tmp/elsewhere.vindex").exists()


def test_a_read_only_server_holds_no_sessions(serve: Serve, browse_vx: Path) -> None:
    with serve(browse_vx) as url:
        r = lql(url, FEATURE, {"X-Larql-Session": "made-up"})
        assert r.status_code == 404 and "expired or was never issued" in r.json()["error"]["message"]
