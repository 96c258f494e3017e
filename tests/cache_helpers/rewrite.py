"""Rewrite a file in place (same size, same inode) as fast as possible, alternating two contents,
until killed: a writer updating a dataset while a sync copies it."""
import os
import sys

path, first, second = sys.argv[1], open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read()
fd = os.open(path, os.O_WRONLY)
print("writing", flush=True)
while True:
    for data in (first, second):
        os.pwrite(fd, data, 0)
