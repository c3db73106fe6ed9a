"""Files and directories, as every layer writes and reads them; leaves that import nothing from
larql but errors, so the parser, the model, the vindex and the shells may all use them.

    cachedir.py   where larql keeps what it can rebuild ($LARQL_CACHE, XDG, ~/.cache/larql)
    jsonfile.py   bounded, strict JSON reading of files larql did not necessarily write
    pathguard.py  whether writing a path would touch what the writer reads
    tempfiles.py  the temporary names outputs are written under, and the clean-up of stale ones
"""
