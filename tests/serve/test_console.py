"""The console's HTTP side against a real server: the page and its files (package data, nothing
from elsewhere, a strict content policy) and the completion routes its editor calls."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from larql.serve.console import STATIC


def test_page_and_files_come_from_this_server_only(browse: str) -> None:
    r = httpx.get(f"{browse}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert re.findall(r'(?:src|href)="([^"]+)"', r.text) == ["data:,", "/console/console.css", "/console/console.js"]
    for name, kind in (("console.js", "javascript"), ("console.css", "text/css")):
        f = httpx.get(f"{browse}/console/{name}")
        assert f.status_code == 200 and kind in f.headers["content-type"] and f.text == (STATIC / name).read_text()
    for path in STATIC.iterdir():  # no CDN, no fonts or scripts fetched from anywhere else
        urls = set(re.findall(r"https?://[^\s\"')]+", path.read_text()))
        assert urls <= {"http://www.w3.org/2000/svg"}, (path.name, urls)
    r = httpx.get(f"{browse}/console/../app.py")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFound"


def test_static_files_are_package_data() -> None:
    import tomllib

    data = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["larql.serve"]
    assert sorted(p.name for p in STATIC.iterdir()) == ["console.css", "console.js", "index.html"]
    assert all(any(Path("console", p.name).match(g) for g in globs) for p in STATIC.iterdir())


def test_keywords_are_the_grammars(browse: str) -> None:
    words = httpx.get(f"{browse}/v1/lql/keywords").json()["keywords"]
    assert {"DESCRIBE", "TRACE", "FOR", "POSITIONS", "SELECT", "USE", "REMOTE"} <= set(words)
    assert words == sorted(words) and all(w.replace("_", "").isalpha() and w.isupper() for w in words)


def test_completion_is_the_repls(browse: str) -> None:
    def complete(text: str) -> list[dict]:
        r = httpx.post(f"{browse}/v1/lql/complete", json={"text": text})
        assert r.status_code == 200, r.text
        return r.json()["suggestions"]

    assert complete("DESC") == [{"text": "DESCRIBE", "start": 4, "kind": "keyword"}]
    after = [s["text"] for s in complete('SHOW LAYERS; TRACE "hello" ')]
    assert {"FOR", "POSITIONS", "DECOMPOSE", "LAYERS"} <= set(after)
    assert complete('USE "/') == [] and complete('APPLY PATCH "../') == []  # the server's files are not listed
    r = httpx.post(f"{browse}/v1/lql/complete", json={"query": "DESC"})
    assert r.status_code == 400 and '"text"' in r.json()["error"]["message"]
