"""kiln's engine: the stage table, keys, the runner and how stages are executed, the build
folder's publishing. It imports the contract (contract/), the cache (cache/) and nothing above
it; stages are named by "module:function" strings, never imported here."""
