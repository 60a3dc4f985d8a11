"""Where checkpoints are kept beyond one host's disk.

    object_storage.py  an S3-compatible bucket (pyarrow.fs): names, markers, listing, pruning
"""
