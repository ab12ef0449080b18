"""The Beam jobs as a package for Dataflow workers: `--setup_file infra/dataflow/setup.py`.

Beam builds an sdist of this folder and installs it on every worker, so the workers can import
`pipelines` (the DoFns the job pickles live there). `pipelines` here is a symbolic link to the
repository's `pipelines/`, the only package the jobs need; torch, DeepSpeed and Prefect stay out
of the workers. The dependencies are `requirements.txt` beside this file.
"""
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
REQUIREMENTS = [line.strip() for line in (HERE / "requirements.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

setup(
    name="bert-dag-pipelines",
    version="0.1.0",
    description="Beam jobs of the BERT DAG (extraction, corpus, vocabulary, shards)",
    packages=["pipelines"],
    install_requires=REQUIREMENTS,
    python_requires=">=3.10",
)
