"""`larql serve`: a vindex (or a model) over HTTP and WebSocket, on Starlette + uvicorn.

    server.py        uvicorn: `larql serve` and a server thread for tests; app.py: the routes assembled
    http.py          what every route module shares: state, JSON errors; config.py: what the server allows
    lql_routes.py    /v1/health, /v1/info, /v1/lql, the REST shortcuts; attention.py: /v1/attention
    openai_api.py    the OpenAI routes; generation.py: generation for them and /v1/stream; embeddings.py
    sessions.py      what is served and each client's own edits; guard.py: what a request may do
    batcher.py       next-token passes that arrive together run as one
    ffn_remote.py    a layer range's FFN over HTTP; expert_remote.py: an expert range; shard.py: their shared parts
    console.py       the browser console at /

    GET  /v1/health                     {"status": "ok", "version"}
    GET  /v1/info                       model, layers, level, limits, this client's patches
    POST /v1/lql  {"query": "..."}      {"results": [...]}: one `larql lql --json` object per result
    GET|POST /v1/describe|walk|infer|trace   one statement from parameters; its result object
    DELETE /v1/session                  drop this client's session (its edits)
    POST /v1/completions, /v1/chat/completions   OpenAI-compatible ("stream": true for SSE), with
                                        logprobs, top_logprobs, n and (completions) echo
    GET  /v1/models, /v1/models/{id}    the served model, in OpenAI's list shape
    POST /v1/embeddings                 mean-pooled `hook_final_norm` vectors (float or base64)
    WS   /v1/stream                     token frames, a done frame; {"type": "cancel"} stops
    GET|POST /v1/attention              every head's attention pattern for a prompt (a layer, or all)
    GET  /                              the browser console (larql/serve/console.py)
    GET  /v1/lql/keywords, POST /v1/lql/complete   the console editor's completion

Read-only unless started with --allow-edits; then a client's first write opens a session (header
X-Larql-Session, cookie larql_session) whose overlay holds its edits only. With --token, writes
need `Authorization: Bearer <token>`. Nothing here is imported by `import larql`.
"""
