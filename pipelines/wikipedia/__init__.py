"""Wikipedia extraction's pure functions: reading a dump (`dump`) and turning wikitext into
clean passages (`wikitext`). `pipelines/extract_wikipedia.py` wires them into Beam."""
