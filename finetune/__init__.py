"""Fine-tuning and evaluation of a pre-trained encoder on the paper's downstream tasks."""
