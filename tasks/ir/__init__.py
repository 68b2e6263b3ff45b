"""kiln's loop-level IR: plain data shared by lower, schedule and the code generators.

`dtypes` and `expr` hold the scalar vocabulary (one closed Enum of ops), `nodes` the graph of
buffers and the nodes that compute them, `serialize` canonical JSON, `text` the readable form,
`verify` the checker run at every stage boundary in tests, `interpret` the CPU oracle.
"""
