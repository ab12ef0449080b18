"""The shared books (shared/data/books), by file stem."""

from __future__ import annotations

BOOK_NAMES = ["austen-emma", "austen-persuasion", "austen-sense", "blake-poems",
              "chesterton-ball", "chesterton-brown", "chesterton-thursday",
              "melville-moby_dick", "shakespeare-caesar", "shakespeare-hamlet",
              "shakespeare-macbeth", "whitman-leaves"]
