"""`omrl view`: a read-only trajectory viewer in the browser (Starlette), and its static export.

data.py reads the store (confined DuckDB only), pages.py renders escaped HTML from templates/, app.py
serves it, export.py writes the same pages as files. Assets in static/ are shipped with the package.
"""
