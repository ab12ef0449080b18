"""The Beam jobs as a package for Dataflow workers: `--setup_file infra/dataflow/setup.py`.

Beam builds an sdist of this folder and installs it on every worker, so the workers can import
`pipelines` (the DoFns the job pickles live there) and `common` (storage, tokenization, the shard
format they use). `pipelines` and `common` here are symbolic links to the repository's folders,
the only packages the jobs need; torch, DeepSpeed and Prefect stay out of the workers. The
dependencies are `requirements.txt` beside this file.
"""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
REQUIREMENTS = [line.strip() for line in (HERE / "requirements.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

setup(
    name="bert-dag-pipelines",
    version="0.1.0",
    description="Beam jobs of the BERT DAG (extraction, corpus, vocabulary, shards)",
    packages=find_packages(include=["pipelines", "pipelines.*", "common", "common.*"]),
    install_requires=REQUIREMENTS,
    python_requires=">=3.11",
)
