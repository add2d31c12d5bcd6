#!/usr/bin/env python3
"""Which pages each commit in an SQLite ledger's WAL wrote, by table or index (#23).

    python3 benches/gateway/wal_pages.py LEDGER.db [COMMITS]

Every page a commit changes is written whole to the WAL (and fsynced, for a synced
commit), so pages per request is what the ledger's disk path costs. Run it on the
ledger of a purser that has served some requests and not yet started its WAL over
(a fresh ledger: `benches/gateway/serve.sh` with `PURSER_BENCH_LEDGER_DIR`, then a
few requests with curl or wrk). It reads the WAL's frames of the current generation
(the header's salts), cuts them at each commit frame, and names each page's b-tree
from SQLite's `dbstat` on a copy of the database and its WAL, so the live ledger is
never opened. Prints the last COMMITS commits (default 6), and the mean pages per
commit over all of them.
"""
import collections
import os
import shutil
import sqlite3
import struct
import sys
import tempfile


def frames(wal: bytes):
    """(page number, is a commit) of each valid frame of the WAL's current generation."""
    if len(wal) < 32:
        return []
    _magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = struct.unpack(">8I", wal[:32])
    out, off = [], 32
    while off + 24 + page_size <= len(wal):
        page, db_size, s1, s2 = struct.unpack(">4I", wal[off : off + 16])
        if (s1, s2) != (salt1, salt2):
            break  # a frame of an earlier generation: the WAL's end
        out.append((page, db_size != 0))
        off += 24 + page_size
    return out


def btree_names(db: str):
    """Page number -> table or index name, read from a copy (database and WAL)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "ledger.db")
        shutil.copyfile(db, copy)
        shutil.copyfile(db + "-wal", copy + "-wal")
        conn = sqlite3.connect(copy)
        try:
            return dict((p, n) for n, p in conn.execute("SELECT name, pageno FROM dbstat"))
        finally:
            conn.close()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    db = sys.argv[1]
    last = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    with open(db + "-wal", "rb") as f:
        wal = f.read()
    names = btree_names(db)
    commits, current = [], []
    for page, commit in frames(wal):
        current.append(page)
        if commit:
            commits.append(current)
            current = []
    if not commits:
        sys.exit("no commit in the WAL's current generation")
    for pages in commits[-last:]:
        by = collections.Counter(names.get(p, f"page {p}") for p in pages)
        print(f"{len(pages):3} pages: " + ", ".join(f"{n} {k}" for n, k in sorted(by.items())))
    total = sum(len(c) for c in commits)
    print(f"{len(commits)} commits, {total} pages, {total / len(commits):.1f} pages per commit")


if __name__ == "__main__":
    main()
