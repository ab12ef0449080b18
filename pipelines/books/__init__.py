"""Book extraction's pure functions: one book file -> title and clean passages (`cleaning`).
`pipelines/extract_books.py` wires them into Beam."""
