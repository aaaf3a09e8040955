"""The change logs: how the application's writes to the live table reach mover while the rows
move, and how they are replayed onto the other table.

- changelog.py  the capture triggers installed, upgraded and removed; each log replayed in batches
                (one statement a batch, a table's or a whole migration's), the drain loop
- logical.py    `[capture] method = "logical"`: the same log fed from a replication slot instead
- pgoutput.py   the decoder of the pgoutput wire format logical.py reads
- integrity.py  capture verified, not assumed (invariant 14): the marks of what was installed,
                checked in every drain and under the swap's lock; a gap recorded and refused
"""
