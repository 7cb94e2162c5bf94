#!/usr/bin/env python3
"""bench_serve.py — load generator for `dsv4 serve` (Python 3.8+, standard library only).

  python3 tools/bench_serve.py URL [--conc 1,8,32] [--tokens 64] [--rounds 2] [--mode waves|free]
                               [--temperature 0.8] [--key KEY] [--json]

At each concurrency C, `rounds` times C streaming completions (different
prompts, max_tokens = tokens, seeded, at --temperature: 0.8 by default, the
whole distribution sampled; 0 is greedy). --mode waves (the default): a round is a wave,
its C requests sent together and the next wave sent when all of them have
ended, so a wave's prompts are prefilled together and its streams then decode
together, as `dsv4 bench --batch C` measures the engine (prefills first, then
C sequences decoding). --mode free: C workers each send their requests one
after the other, so new prompts are prefilled inside the other streams'
decoding (a server's steady state; the decode rate then includes that prefill
work). Reports output tokens/s over the level's wall time, decode tokens/s (the
tokens after each stream's first over the summed per-stream time from its first
token to its end, times C), time to first token and time per output token
(p50 / p99), and the CPU this client itself used over the level's wall time
(client_cpu: 0.5 = half a core; on a small machine it is taken from the server
it measures). --json: one JSON object per level instead of the table
(scripts/bench-serve.sh reads it).

One thread and one keep-alive connection per stream (http.client). Per event
only a cheap scan: the first event whose text is non-empty stamps the first
token; the usage event (include_usage) gives the token count, the only event
parsed as JSON. Python, not Node, so that it runs wherever the server's
machine has a python3 (the GPU lease machine has no Node).
"""
import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

PROMPTS = ['In the beginning God created', 'And the LORD spake unto Moses, saying', 'Blessed are the poor in spirit',
           'The LORD is my shepherd', 'And it came to pass in those days', 'For God so loved the world']


def usage():
    sys.exit(__doc__.split('\n\n')[1])


def parse_args(argv):
    if not argv or argv[0].startswith('-'):
        usage()
    o = {'url': argv[0], 'conc': '1,8,32', 'tokens': '64', 'rounds': '2', 'mode': 'waves', 'temperature': '0.8',
         'key': os.environ.get('DSV4_API_KEY', ''), 'json': False}
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == '--json':
            o['json'] = True
            i += 1
        elif a in ('--conc', '--tokens', '--rounds', '--mode', '--temperature', '--key') and i + 1 < len(argv):
            o[a[2:]] = argv[i + 1]
            i += 2
        else:
            sys.exit(f"bench_serve: unknown or incomplete option '{a}'")
    if o['mode'] not in ('waves', 'free'):
        sys.exit(f"bench_serve: --mode is waves or free, not '{o['mode']}'")
    try:
        o['levels'] = [int(c) for c in o['conc'].split(',')]
        o['tokens'] = int(o['tokens'])
        o['rounds'] = int(o['rounds'])
    except ValueError:
        sys.exit(f"bench_serve: --conc, --tokens and --rounds take integers (got '{o['conc']}', "
                 f"'{o['tokens']}', '{o['rounds']}')")
    try:
        o['temperature'] = float(o['temperature'])
    except ValueError:
        sys.exit(f"bench_serve: --temperature takes a number (got '{o['temperature']}')")
    if min(o['levels']) < 1 or o['tokens'] < 1 or o['rounds'] < 1:
        sys.exit('bench_serve: --conc, --tokens and --rounds must be >= 1')
    u = urllib.parse.urlsplit(o['url'])
    if u.scheme != 'http' or not u.hostname:
        sys.exit(f"bench_serve: URL '{o['url']}' is not http://HOST:PORT")
    o['host'], o['port'], o['base'] = u.hostname, u.port or 80, u.path.rstrip('/')
    return o


class Client:
    """One worker's keep-alive connection."""

    def __init__(self, o):
        self.o = o
        self.conn = http.client.HTTPConnection(o['host'], o['port'], timeout=600)

    def one(self, i):
        o = self.o
        body = json.dumps({'prompt': PROMPTS[i % len(PROMPTS)], 'max_tokens': o['tokens'], 'temperature': o['temperature'],
                           'seed': i, 'stream': True, 'stream_options': {'include_usage': True}})
        headers = {'Content-Type': 'application/json'}
        if o['key']:
            headers['Authorization'] = 'Bearer ' + o['key']
        t0 = time.perf_counter()
        self.conn.request('POST', o['base'] + '/v1/completions', body, headers)
        res = self.conn.getresponse()
        if res.status != 200:
            raise RuntimeError(f'HTTP {res.status}: {res.read().decode(errors="replace")}')
        first, n = 0.0, 0
        for line in res:  # SSE: 'data: {...}\n' then a blank line
            if not line.startswith(b'data: {'):
                continue
            if not first and b'"text":"' in line and b'"text":""' not in line:
                first = time.perf_counter()
            if b'"usage":{' in line:
                n = json.loads(line[6:])['usage']['completion_tokens']
        t1 = time.perf_counter()
        if not first:
            first = t1  # no text at all (every token held back or empty): all of it was waiting
        return {'ttft': first - t0, 'tpot': (t1 - first) / (n - 1) if n > 1 else 0.0, 'n': n, 'first': first, 't1': t1}


def run_all(jobs):
    """jobs: one list of (client, request index) per thread; returns every result, or raises the first error."""
    out, errs = [], []
    lock = threading.Lock()

    def work(js):
        try:
            rs = [c.one(i) for c, i in js]
            with lock:
                out.extend(rs)
        except Exception as e:  # noqa: BLE001 (reported below, the run fails)
            with lock:
                errs.append(e)

    ts = [threading.Thread(target=work, args=(js,)) for js in jobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return out


def pct(a, p):
    s = sorted(a)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def main():
    o = parse_args(sys.argv[1:])
    if not o['json']:
        print('conc  requests  out_tok/s  decode_tok/s  ttft_p50  ttft_p99  tpot_p50  tpot_p99   (seconds)  client_cpu')
    for c in o['levels']:
        clients = [Client(o) for _ in range(c)]
        try:
            run_all([[(cl, w)] for w, cl in enumerate(clients)])  # warm-up round
            t0, cpu0 = time.perf_counter(), time.process_time()
            if o['mode'] == 'waves':
                res = []
                for r in range(o['rounds']):
                    res += run_all([[(cl, 1000 * c + w * o['rounds'] + r)] for w, cl in enumerate(clients)])
            else:
                res = run_all([[(cl, 1000 * c + w * o['rounds'] + r) for r in range(o['rounds'])]
                               for w, cl in enumerate(clients)])
        except (OSError, RuntimeError, http.client.HTTPException) as e:
            sys.exit(f"bench_serve: {o['url']}: {e}")
        wall = time.perf_counter() - t0
        client_cpu = (time.process_time() - cpu0) / wall
        for cl in clients:
            cl.conn.close()
        total = sum(r['n'] for r in res)
        # decode rate: tokens after the first of each stream over the summed per-stream decode time, times C
        dec_t = sum(r['t1'] - r['first'] for r in res)
        dec = sum(r['n'] - 1 for r in res) / dec_t * c if dec_t > 0 else 0.0
        q = {k: [r[k] for r in res] for k in ('ttft', 'tpot')}
        if o['json']:
            print(json.dumps({'conc': c, 'mode': o['mode'], 'temperature': o['temperature'], 'requests': len(res), 'out_tok_s': total / wall,
                              'decode_tok_s': dec, 'ttft_p50': pct(q['ttft'], 50), 'ttft_p99': pct(q['ttft'], 99),
                              'tpot_p50': pct(q['tpot'], 50), 'tpot_p99': pct(q['tpot'], 99),
                              'client_cpu': client_cpu}), flush=True)
            continue
        print(f"{c:4d}  {len(res):8d}  {total / wall:9.1f}  {dec:12.1f}  {pct(q['ttft'], 50):8.4f}  "
              f"{pct(q['ttft'], 99):8.4f}  {pct(q['tpot'], 50):8.4f}  {pct(q['tpot'], 99):8.4f}  {client_cpu:10.2f}",
              flush=True)


if __name__ == '__main__':
    main()
