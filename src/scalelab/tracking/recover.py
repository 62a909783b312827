"""Find and close MLflow runs that say RUNNING although their process is gone; send the
metrics a tracking outage left in a run folder.

    python -m scalelab.tracking.recover stale [--tracking-uri URI] [--mark]
    python -m scalelab.tracking.recover replay <run folder> [--tracking-uri URI]

``stale`` lists RUNNING runs started on this host whose PID (tags ``scalelab.pid`` /
``scalelab.pid_start``) is no longer alive: SIGKILL, the OOM killer, a power cut. ``--mark``
closes them as KILLED with the tag ``scalelab.stale`` saying why. ``scalelab-train
resume=true`` on such a run, or rerunning its sweep, also closes it (and continues it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

from scalelab.paths import repo_root
from scalelab.tracking.redact import redact
from scalelab.tracking.run import client_for
from scalelab.tracking.store import resolve_tracking_uri
from scalelab.tracking.sweep import STALE_TAG, process_alive


def stale_runs(client: MlflowClient) -> list[Run]:
    """RUNNING runs of this host whose process is gone (runs of other hosts are not judged)."""
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not exps:
        return []
    host = socket.gethostname()
    runs = client.search_runs(exps, "attributes.status = 'RUNNING'", max_results=5000)
    return [r for r in runs if r.data.tags.get("scalelab.host") == host
            and not process_alive(r.data.tags)]


def mark_stale(client: MlflowClient, run: Run) -> None:
    tags = run.data.tags
    client.set_tag(run.info.run_id, STALE_TAG,
                   f"process {tags.get('scalelab.pid')} on {tags.get('scalelab.host')} ended "
                   "without recording an end (SIGKILL, out of memory or power loss)")
    client.set_terminated(run.info.run_id, "KILLED")


def replay_folder(folder: Path, tracking_uri: str | None) -> int:
    """Send a run folder's mlflow_pending.jsonl to its run; returns the number of calls."""
    from scalelab.tracking.run import replay_pending

    rid = folder / "mlflow_run_id"
    if not rid.is_file():
        raise ValueError(f"{folder}: no mlflow_run_id file (not a run folder?)")
    uri = tracking_uri
    summary = folder / "summary.json"
    if uri is None and summary.is_file():
        uri = json.loads(summary.read_text()).get("tracking_uri")
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise ValueError(f"{folder}: pass --tracking-uri (the store the run was created in)")
    return replay_pending(client_for(uri), rid.read_text().strip(), folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalelab.tracking.recover", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["stale", "replay"])
    ap.add_argument("folder", nargs="?", help="replay: the run folder")
    ap.add_argument("--tracking-uri", default=None)
    ap.add_argument("--mark", action="store_true", help="stale: close them as KILLED")
    a = ap.parse_args(argv)
    try:
        if a.command == "replay":
            if not a.folder:
                raise ValueError("replay needs the run folder")
            n = replay_folder(Path(a.folder).expanduser().resolve(), a.tracking_uri)
            print(f"sent {n} pending call(s)" if n else "nothing pending")
            return 0
        uri = resolve_tracking_uri(a.tracking_uri, repo_root())
        client = client_for(uri)
        runs = stale_runs(client)
        for r in runs:
            t = r.data.tags
            print(f"{r.info.run_id}  {r.info.run_name or '':<30} pid {t.get('scalelab.pid')} gone"
                  + ("  -> KILLED" if a.mark else ""))
            if a.mark:
                mark_stale(client, r)
        print(f"{len(runs)} RUNNING run(s) in {redact(uri)} whose process is gone"
              + ("" if a.mark or not runs else "; --mark closes them as KILLED"))
        return 0
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
