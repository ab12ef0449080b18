"""WordPiece vocabulary training's pure functions (`wordpiece`). `pipelines/train_vocab.py`
wires them into Beam."""
