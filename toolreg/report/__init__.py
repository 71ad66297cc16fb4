"""What result logs say: `python -m toolreg stats` (per-tool figures) and `python -m toolreg
report` (one self-contained HTML page: a timeline of the calls, latency distributions, the stats
table).

The commands are the interface; nothing here is public API yet. Reading logs and the stats need
nothing beyond toolreg; only writing a report needs the plotting library (extra `report`:
`pip install 'toolreg-quiescent[report]'`), imported when a report is written. Importing
`toolreg` never imports this package.
"""

__all__: list[str] = []
