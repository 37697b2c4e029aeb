"""A consumer in a process of its own, for tests that kill consumers.

    python -m tests.consumer_proc ADDRESS URI hold N   # take N messages, report, wait to be killed
    python -m tests.consumer_proc ADDRESS URI crash    # die (exit 3) on the first message, unconfirmed
"""

from __future__ import annotations

import os
import sys
import time

from taproot import Session


def main() -> None:
    address, uri, mode = sys.argv[1:4]
    with Session([address]) as session, session.open_queue(uri, read=True) as queue:
        print("READY", flush=True)
        held = []
        for message in queue.messages(timeout_s=300):
            if mode == "crash":
                print(f"GOT {message.sequence} {message.delivery_count}", flush=True)
                os._exit(3)
            held.append(message)
            if len(held) == int(sys.argv[4]):
                print(f"HELD {len(held)}", flush=True)
                time.sleep(600)


if __name__ == "__main__":
    main()
