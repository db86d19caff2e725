"""`make demo`: bring a profile up in the background, watch /v1/health/ready go from 503 to 200,
ask for one completion through the gateway, and print it. The deployment keeps running;
stop it with `radiance down <name>`.

    python tools/demo.py [PROFILE]
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml


def main() -> int:
    profile_path = sys.argv[1] if len(sys.argv) > 1 else "profiles/tiny-cpu.yaml"
    prof = yaml.safe_load(Path(profile_path).read_text())
    name = prof["name"]
    port = prof.get("server", {}).get("port", 8000)
    base = f"http://127.0.0.1:{port}"
    model = prof.get("model", {}).get("served_name") or name

    up = subprocess.Popen([sys.executable, "-m", "launcher", "up", profile_path, "--detach"])
    seen: dict[int, float] = {}
    t0 = time.monotonic()
    while up.poll() is None:
        try:
            code = httpx.get(base + "/v1/health/ready", timeout=2).status_code
            seen.setdefault(code, time.monotonic() - t0)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    if up.returncode != 0:
        print(f"demo: `radiance up` failed with exit code {up.returncode}", file=sys.stderr)
        return up.returncode
    final = httpx.get(base + "/v1/health/ready", timeout=5)
    seen.setdefault(final.status_code, time.monotonic() - t0)
    print(f"demo: /v1/health/ready answered 503 first at {seen.get(503, float('nan')):.1f}s, "
          f"200 at {seen.get(200, float('nan')):.1f}s")
    r = httpx.post(base + "/v1/completions", timeout=120,
                   json={"model": model, "prompt": "def fibonacci(n):", "max_tokens": 24, "temperature": 0})
    r.raise_for_status()
    text = r.json()["choices"][0]["text"]
    print(f"demo: completion through the gateway: {text!r}")
    st = subprocess.run([sys.executable, "-m", "launcher", "status", name, "--json"], capture_output=True, text=True)
    if st.returncode == 0:
        patches = {p["feature"]: p["status"] for p in json.loads(st.stdout).get("patches", []) if p["feature"]}
        applied = [f for f, s in patches.items() if s == "applied"]
        rest = ", ".join(f"{f}: {s}" for f, s in patches.items() if s != "applied")
        print(f"demo: {len(applied)} patches applied: {', '.join(applied)}" + (f" ({rest})" if rest else ""))
    print(f"demo: {name} is serving at {base}/v1 — stop it with `radiance down {name}`")
    return 0 if 503 in seen and final.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
