"""Send one text to a Triton server that serves a cosycompile CPU bundle and write the answer as a wav.

    python examples/04-triton-server/client.py --url 127.0.0.1:8000 --text "Hello." --out hello.wav

Waits (at most --wait seconds) for the server to say it is ready, then calls the offline model over
HTTP. The text goes as UTF-8 bytes (`target_text_utf8`): the python backend of tritonserver 2.51
garbles BYTES tensors under numpy 2 (the repository's README.md says why).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import soundfile as sf
import tritonclient.http as httpclient


def wait_ready(url: str, seconds: float) -> None:
    """Poll the server's readiness endpoint until it answers 200 or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            sys.exit(f"client: the server at {url} was not ready within {seconds:.0f} s")
        time.sleep(1.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="127.0.0.1:8000", help="the server's HTTP address")
    ap.add_argument("--model", default="cosyvoice2_offline", help="FAMILY_offline of the bundle's family")
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True, help="wav file to write")
    ap.add_argument("--rate", type=int, default=24000, help="the bundle's sample rate")
    ap.add_argument("--wait", type=float, default=180.0, help="seconds to wait for the server to be ready")
    args = ap.parse_args()

    wait_ready(args.url, args.wait)
    text = np.frombuffer(args.text.encode(), np.uint8)[None]
    client = httpclient.InferenceServerClient(args.url, connection_timeout=300, network_timeout=300)
    inp = httpclient.InferInput("target_text_utf8", list(text.shape), "UINT8")
    inp.set_data_from_numpy(text)
    wav = client.infer(args.model, [inp]).as_numpy("waveform")[0]
    sf.write(args.out, wav, args.rate)
    print(f"wrote {args.out}: {len(wav) / args.rate:.2f} s of audio")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
