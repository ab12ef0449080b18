"""`--runner=DataflowRunner` without what Dataflow needs ends in one line naming it, exit 2,
before Beam builds anything (`pipelines.dataflow.dataflow_preflight`); Beam itself retries the
credentials for about two minutes and ends in a traceback of some 180 lines, exit 1. This
machine has no Google credentials, so the job runs for real; `NO_GCE_CHECK` tells google-auth
this is no Compute Engine VM, so that the test says the same on one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import dataflow

pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient",
                    reason="needs the gcp extra: pip install 'apache-beam[gcp]==2.77.0'")

REPO = Path(__file__).resolve().parents[2]
BOOKS = REPO / "data" / "sample" / "books"
DATAFLOW = ["--runner=DataflowRunner", "--project=my-project", "--region=us-central1",
            "--temp_location=gs://my-bucket/tmp"]
NO_CREDENTIALS = ("Google credentials (Your default credentials were not found: run `gcloud "
                  "auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a "
                  "service account's JSON key file)")


def _no_credentials_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG",
                        "CLOUDSDK_COMPUTE_REGION")}
    return {**env, "HOME": str(home), "NO_GCE_CHECK": "True", "HF_HUB_OFFLINE": "1"}


def _beam_run(job: str, args: list[str], home: Path) -> subprocess.CompletedProcess:
    # Beam alone takes ~90 s here before it fails: the timeout fails the test first.
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "run", f"pipelines/{job}.py",
                           *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=_no_credentials_env(home), check=False)


def test_a_dataflow_run_without_credentials_fails_in_one_line(tmp_path):
    out = tmp_path / "out"
    done = _beam_run("extract_books", ["--input", str(BOOKS), "--output", str(out), *DATAFLOW],
                     tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"extract_books: error: --runner=DataflowRunner needs {NO_CREDENTIALS}"]
    assert done.stdout == "" and not out.exists()


def test_every_missing_option_is_named_in_the_same_line(tmp_path):
    done = _beam_run("extract_books", ["--input", str(BOOKS), "--output", str(tmp_path / "o"),
                                       "--runner", "DataflowRunner", "--project=p",
                                       "--temp_location=gs://b/tmp"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "extract_books: error: --runner=DataflowRunner needs --project=p (a project ID such as "
        "my-project, not its number or name); --region=...; --temp_location=gs://b/tmp "
        "(gs://BUCKET/FOLDER, a bucket name of 3 to 63 characters a-z 0-9 - _ .); "
        + NO_CREDENTIALS]


def test_a_dry_run_needs_no_credentials(tmp_path):
    """The README's Dataflow dry run, with a valid project ID and bucket names (Beam swaps an
    invalid bucket for a default one, which it then tries to create)."""
    out = tmp_path / "out"
    done = _beam_run("extract_books", ["--input", str(BOOKS), "--output", str(out), *DATAFLOW,
                                       "--dry_run=True", "--no_auth",
                                       "--staging_location=gs://my-bucket/staging",
                                       "--sdk_location=container"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "extract_books: dry run on DataflowRunner: the job graph" in done.stderr
    assert not out.exists()


def test_preflight_reads_google_auths_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    with pytest.raises(ValueError) as error:
        dataflow.dataflow_preflight(["--input", "x", *DATAFLOW])
    assert str(error.value) == (
        f"--runner=DataflowRunner needs Google credentials: GOOGLE_APPLICATION_CREDENTIALS="
        f"{tmp_path / 'key.json'} is no file (a service account's JSON key)")
    # an application-default file as `gcloud auth application-default login` writes it
    (tmp_path / "key.json").write_text(json.dumps({
        "type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
        "client_secret": "secret", "refresh_token": "token"}))
    assert dataflow.dataflow_preflight(["--input", "x", *DATAFLOW]) is None
    assert dataflow.dataflow_preflight(["--runner", "dataflow", "--project", "my-project",
                                    "--region", "europe-west1",
                                    "--staging_location", "gs://my-bucket/staging"]) is None


def test_other_runners_are_not_checked(monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    for argv in ([], ["--runner=DirectRunner"], ["--runner", "FlinkRunner", "--project=p"]):
        assert dataflow.dataflow_preflight(argv) is None
