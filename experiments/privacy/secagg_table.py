#!/usr/bin/env python3
"""Per-round cost of SecAgg+ against plain FedAvg from a records database (docs/records.md v11), as the markdown
table of docs/privacy.md "Secure aggregation: what it costs per link kind".

Usage: secagg_table.py RECORDS_DB [NAME_PREFIX]   (default prefix: secagg-cost-)

One row per experiment named <prefix>k<K>-<link>-<mode> (the newest of each name), over its committed rounds
after the first (round 0 carries the sessions' warm-up): the median round time; per client and round the
uplink bytes (client_rounds.uplink_bytes: the update, masked or not) and the key stages' bytes (secagg_stages:
both ways, advertise_keys + share_keys + the shares sent down with masked_upload + unmask; not the masked update); the median over
clients of each stage's time (from the server's message to the client's answer, server clock); the uplink's
share of the round (median client uplink_ms / the round's duration) and the key stages' round trips' share (each
stage's span on the server's clock: first message sent to last answer, advertise_keys + share_keys + unmask,
over the round's duration). Medians are over every (round, client) of the committed rounds counted.
"""
import re
import sqlite3
import statistics
import sys

NAME = re.compile(r"k(\d+)-([a-z0-9-]+)-(plain|secagg)(?:-drop(\d+))?$")
LINK_ORDER = {"none": 0, "ethernet": 1, "wifi": 2, "5g-sa": 3}


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, unit="", nd=0):
    if x is None:
        return "–"
    return f"{x:,.{nd}f}{unit}"


def rows_of(db, exp):
    q = lambda sql, *a: db.execute(sql, (exp,) + a).fetchall()
    rounds = q("SELECT round, duration_ms, secagg_survivors, secagg_dropped, num_accepted, attempt, ended_unix_ms "
               "FROM rounds WHERE experiment_id = ? AND status = 'committed' ORDER BY round")
    attempts = q("SELECT count(*) FROM rounds WHERE experiment_id = ?")[0][0]
    counted = [r for r in rounds if r[0] > min(r[0] for r in rounds)] if len(rounds) > 1 else rounds
    keep = {r[0] for r in counted}
    attempt_of = {r[0]: r[5] for r in counted}  # the committed attempt of each round
    out = {"rounds": len(rounds), "counted": len(counted), "attempts": attempts}
    if not counted:
        return out
    out["round_ms"] = median([r[1] for r in counted])
    out["survivors"] = median([r[2] for r in counted])
    out["dropped"] = median([r[3] for r in counted])
    cr = [c[:6] for c in q("SELECT round, uplink_bytes, uplink_ms, downlink_bytes, downlink_ms, train_ms, attempt "
                           "FROM client_rounds WHERE experiment_id = ? AND outcome = 'ok'")
          if c[0] in keep and c[6] == attempt_of[c[0]]]
    out["up_bytes"] = median([c[1] for c in cr])
    out["down_bytes"] = median([c[3] for c in cr])
    up_share = []
    for rnd, dur, *_ in counted:
        ups = [c[2] for c in cr if c[0] == rnd and c[2] is not None]
        if ups and dur:
            up_share.append(statistics.median(ups) / dur)
    out["up_share"] = median(up_share)
    st = [s[:8] for s in q("SELECT round, client_id, stage, started_unix_ms, duration_ms, bytes_down, bytes_up, "
                           "outcome, attempt FROM secagg_stages WHERE experiment_id = ?")
          if s[0] in keep and s[8] == attempt_of[s[0]]]
    if not st:
        return out
    per_client = {}
    for rnd, client, stage, _, _, down, up, _ in st:
        # masked_upload's bytes up are the masked update itself (client_rounds.uplink_bytes): not a key stage's.
        key = (down or 0) + (0 if stage == "masked_upload" else (up or 0))
        per_client[(rnd, client)] = per_client.get((rnd, client), 0) + key
    out["key_bytes"] = median(list(per_client.values()))
    for stage in ("advertise_keys", "share_keys", "masked_upload", "unmask"):
        out[stage] = median([s[4] for s in st if s[2] == stage and s[7] == "ok"])
    # The unmask stage's opening to the commit: the survivors' answers, the reconstruction of the secrets and the
    # removal of the masks (with dropouts: the dropped clients' pairwise masks recomputed from their keys).
    to_commit = []
    for rnd, _, _, _, _, _, ended in counted:
        opened = [s[3] for s in st if s[0] == rnd and s[2] == "unmask" and s[3] is not None]
        if opened and ended:
            to_commit.append(ended - min(opened))
    out["unmask_to_commit"] = median(to_commit)
    key_share = []
    for rnd, dur, *_ in counted:
        span = 0.0
        for stage in ("advertise_keys", "share_keys", "unmask"):
            ss = [s for s in st if s[0] == rnd and s[2] == stage and s[3] is not None]
            ends = [s[3] + s[4] for s in ss if s[4] is not None]
            if ss and ends:
                span += max(ends) - min(s[3] for s in ss)
        if dur:
            key_share.append(span / dur)
    out["key_share"] = median(key_share)
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prefix = sys.argv[2] if len(sys.argv) > 2 else "secagg-cost-"
    db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
    exps = {}
    for exp_id, name, status in db.execute(
            "SELECT id, name, status FROM experiments WHERE name LIKE ? ORDER BY started_unix_ms", (prefix + "%",)):
        m = NAME.search(name[len(prefix):])
        if m:
            exps[name] = (exp_id, status, m)
    print("| K | link | mode | rounds | round (ms) | uplink B/client | key-stage B/client | advertise (ms) "
          "| share keys (ms) | masked upload (ms) | unmask (ms) | unmask→commit (ms) | uplink share "
          "| key round trips share | survivors/dropped |")
    print("|---" * 15 + "|")
    def key(item):
        m = item[1][2]
        return (int(m.group(1)), LINK_ORDER.get(m.group(2), 9), m.group(2), m.group(3), int(m.group(4) or 0))
    for name, (exp_id, status, m) in sorted(exps.items(), key=key):
        r = rows_of(db, exp_id)
        mode = m.group(3) + (f" {m.group(4)}% drop" if m.group(4) else "")
        sd = (f"{fmt(r.get('survivors'))}/{fmt(r.get('dropped'))}" if r.get("survivors") is not None else "–")
        tries = "" if r["attempts"] == r["rounds"] else f" ({r['attempts']} attempts)"
        print(f"| {m.group(1)} | {m.group(2)} | {mode} | {r['counted']}/{r['rounds']}{tries}"
              f"{'' if status == 'finished' else ' (' + status + ')'} | {fmt(r.get('round_ms'))} "
              f"| {fmt(r.get('up_bytes'))} | {fmt(r.get('key_bytes'))} | {fmt(r.get('advertise_keys'), nd=1)} "
              f"| {fmt(r.get('share_keys'), nd=1)} | {fmt(r.get('masked_upload'))} | {fmt(r.get('unmask'), nd=1)} "
              f"| {fmt(r.get('unmask_to_commit'))} "
              f"| {fmt(100 * r['up_share'] if r.get('up_share') is not None else None, '%')} "
              f"| {fmt(100 * r['key_share'] if r.get('key_share') is not None else None, '%', 1)} | {sd} |")


if __name__ == "__main__":
    main()
