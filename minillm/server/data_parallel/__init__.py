"""Data parallelism: N replicas of the server behind one routing front (lesson 10),
`python -m minillm serve --data-parallel-size N [--router-policy cache-aware|round-robin]`.

    client ──► front (FastAPI): route ──► replica 0: `minillm serve` (its own engine, KV pool)
                                     └──► replica 1: ...

    choice.py       the routing decision, one pure function: longest cached prefix within a load bound
    prefix_tree.py  what the router believes each replica has cached: a bounded, LRU prefix tree
    prompts.py      the text a request is routed by (a prompt, or chat messages as one string)
    off_loop.py     ... read in a worker process when the body is big (a parse holds the GIL)
    router.py       the router's state: replicas up, in flight, prefix trees; round-robin, cache-aware
    replicas.py     start the replica processes, wait for them, stop them (no orphans, no logs left)
    remote.py       replicas given by URL (--replica-url): checked, routed to, never restarted
    lifeline.py     a replica ends when its front ends, even a front killed outright
    health.py       replicas in and out of rotation: process exits, /health; a silent one's requests fail
    healing.py      a replica that exited starts again (bounded, with backoff); the front's /health says so
    door.py         what the front refuses itself (oversized headers), never a replica's failure
    proxy.py        forward a request and relay the answer (SSE events whole); errors when a replica fails
    adapters.py     LoRA: runtime load/unload sent to every replica, undone when one fails
    metrics.py      /metrics: each replica's, re-labelled, their totals, the router's counters
    app.py          the front's routes;   main.py  the command line's entry point

Like its parent package, this file imports nothing: `choice.py` needs nothing installed.
"""
