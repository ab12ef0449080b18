"""The corpus: the document records the extraction jobs write (`documents`) and the sentence
splitting build_corpus adds (`sentences`). `pipelines/build_corpus.py` wires them into Beam."""
