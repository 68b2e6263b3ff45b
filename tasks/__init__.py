"""kiln's stages, one module or package each. The stage table lives in pipeline/stages.py."""
