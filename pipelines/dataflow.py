"""Dataflow without what it needs: before a `--runner=DataflowRunner` job builds anything, one
line naming everything it lacks (`dataflow_preflight`), rather than Beam's two minutes of
credential retries and a long traceback."""
from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence

CREDENTIALS_TIMEOUT_S = 5.0
"""How long the credentials lookup may take (google-auth pings the metadata server, up to 3
tries of 3 s each where nothing answers); past it, no credentials were found."""
_GCP_EXTRA = "pip install -e '.[gcp]' (or apache-beam[gcp]==2.77.0)"


def dataflow_preflight(argv: Sequence[str]) -> None:
    """Before a `--runner=DataflowRunner` job builds anything: a ValueError naming everything
    it lacks, in one line (Beam would retry the credentials for about two minutes and then end
    in a long traceback): Beam's GCP extra, `--project`, `--region` (or CLOUDSDK_COMPUTE_REGION),
    a `--temp_location` (or `--staging_location`) of the form gs://BUCKET/FOLDER with a bucket
    name Beam accepts, and Google credentials as google-auth finds them (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default file, the metadata
    server), unless `--no_auth`. Any other runner: nothing is checked."""
    options = _dataflow_options(argv)
    if options is None:
        return
    missing = []
    if not _imports("apache_beam.runners.dataflow.internal.apiclient"):
        missing.append(f"Beam's GCP extra (apache-beam[gcp]: {_GCP_EXTRA})")
    if not options.project:
        missing.append("--project=...")
    elif not re.fullmatch(r"[a-z][-a-z0-9:.]+[a-z0-9]", options.project):
        # Beam refuses a project number or description after building the whole graph
        missing.append(f"--project={options.project} (a project ID such as my-project, not "
                       "its number or name)")
    if not (options.region or os.environ.get("CLOUDSDK_COMPUTE_REGION")):
        missing.append("--region=...")
    locations = {name: getattr(options, name) for name in ("temp_location", "staging_location")
                 if getattr(options, name)}
    bad = [f"--{name}={path} (gs://BUCKET/FOLDER, a bucket name of 3 to 63 characters a-z 0-9 "
           "- _ .)" for name, path in locations.items() if not _gcs_folder(path)]
    missing += bad or ([] if locations else ["--temp_location=gs://BUCKET/tmp"])
    if not options.no_auth:
        problem = missing_credentials()
        if problem:
            missing.append(problem)
    if missing:
        raise ValueError(f"--runner=DataflowRunner needs {'; '.join(missing)}")


def _dataflow_options(argv: Sequence[str]) -> argparse.Namespace | None:
    """The Beam options the preflight reads, when `argv` names the Dataflow runner (Beam takes
    `DataflowRunner`, `dataflow` or a dotted path to the class), else None."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("runner", "project", "region", "temp_location", "staging_location"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--no_auth", action="store_true")
    options, _ = parser.parse_known_args(list(argv))
    runner = str(options.runner or "").rsplit(".", 1)[-1].lower()
    return options if runner in ("dataflowrunner", "dataflow") else None


def _gcs_folder(path: str) -> bool:
    """Whether `path` is a gs:// folder whose bucket name Beam accepts (an invalid one makes it
    fall back on a default bucket that it then tries to create)."""
    match = re.fullmatch(r"gs://([^/]+)/(.+)", path)
    return bool(match) and re.fullmatch(r"[a-z0-9][-_a-z0-9.]{1,61}[a-z0-9]",
                                        match.group(1)) is not None


def _imports(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_credentials(timeout_s: float = CREDENTIALS_TIMEOUT_S) -> str | None:
    """None when google-auth finds Google credentials, else what to set up (one phrase)."""
    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key_file and not os.path.isfile(key_file):
        return (f"Google credentials: GOOGLE_APPLICATION_CREDENTIALS={key_file} is no file "
                "(a service account's JSON key)")
    if not _imports("google.auth"):
        return f"Google credentials, and google-auth to read them ({_GCP_EXTRA})"
    import threading

    import google.auth
    import google.auth.exceptions

    found: list[BaseException | None] = []

    def lookup() -> None:
        try:
            google.auth.default()
            found.append(None)
        except google.auth.exceptions.GoogleAuthError as error:
            found.append(error)

    # A daemon thread: where the metadata server does not answer, the process ends without
    # waiting for google-auth's pings.
    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        return (f"Google credentials (none found within {timeout_s:g} s: no "
                "GOOGLE_APPLICATION_CREDENTIALS, no gcloud application-default login, the "
                "metadata server does not answer)")
    error = found[0]
    if error is not None:
        first = str(error).strip().split(". ")[0].rstrip(".")
        return (f"Google credentials ({first}: run `gcloud auth application-default login` or "
                "set GOOGLE_APPLICATION_CREDENTIALS to a service account's JSON key file)")
    return None
