"""Test data builders shared across the test folders: real shards, GLUE and SQuAD slices, and a toy
fine-tuning family."""
