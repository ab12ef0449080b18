"""A user's own text as documents: the source declaration (`source.SourceConfig`, its weight)
and one pure reader per kind (`readers`); the Beam job is pipelines/extract_documents.py."""
