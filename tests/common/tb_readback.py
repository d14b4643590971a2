"""Reads one TensorBoard event file with TensorBoard's own reader and prints what it saw,
so metrics_test.cpp can check kf::MetricsWriter's hand-encoded records independently.

    tb_readback.py EVENT_FILE
prints one JSON object: {"file_version": ..., "scalars": {tag: [[step, value, wall_time], ...]}}
with non-finite values as the strings "nan", "inf", "-inf".
Exit 0 ok; 3 when the tensorboard package is not importable (message on stderr);
1 when the file does not read back.
"""
import json
import math
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: tb_readback.py EVENT_FILE", file=sys.stderr)
        return 2
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except Exception as e:  # ImportError, or a broken protobuf underneath it
        print(f"tensorboard is not importable by {sys.executable}: {e}; "
              "install requirements.txt (./setup.sh)", file=sys.stderr)
        return 3
    acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()

    def num(v):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v

    out = {
        "file_version": acc.file_version,
        "scalars": {tag: [[e.step, num(e.value), e.wall_time] for e in acc.Scalars(tag)]
                    for tag in acc.Tags()["scalars"]},
    }
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
