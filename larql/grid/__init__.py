"""Scale-out on Ray: a model's FFN spread over Ray actors, by layer range or by expert range, with
replicas, restarts and timeouts from Ray rather than a home-made cluster (docs/vindex_spec/SCALE_OUT.md).
Ray is an optional extra (`pip install 'larql[ray]'`); nothing here imports it until a grid starts.

    layout.py   the shards: layer ranges or expert ranges (`4-7,8-11`), checked against the model
    shard.py    FFNShard, the actor's body: the model memory-mapped, its layers' (or experts') FFN on rows
    edits.py    the client's FFN edits of a shard's layers, carried to the shard as plain arrays
    cluster.py  Ray itself: joining or starting a cluster, starting the actors, one call with retries
    client.py   use_ray / RayGrid: the model with those layers' FFN computed by the actors
"""
