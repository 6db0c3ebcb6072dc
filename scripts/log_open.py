"""Opens a log or CSV for reading as text, plain or compressed (.gz, .xz),
for the analysis scripts beside it (the GPU host's scripts xz their logs)."""
import gzip
import lzma


def open_log(path):
    if path.endswith(".gz"):
        return gzip.open(path, "rt")
    if path.endswith(".xz"):
        return lzma.open(path, "rt")
    return open(path)
