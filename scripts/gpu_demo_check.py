# Demo pair on the GPU: greedy output vs the CPU golden (teacher-forced margins are in the
# verify-golden check), and EAGLE3 acceptance vs the CPU's on the same prompts.
import json, subprocess, sys
bin_ = sys.argv[1]
g = json.load(open('models/pycoder-eagle3/spec_golden.json'))
same = 0; first_diff = []
acc_gpu = []; acc_cpu = []
for t in g['traces']:
    ids = ','.join(map(str, t['prompt']))
    base = [bin_, 'generate', '--device', 'cuda', '--prompt-ids', ids, '--max-tokens', '64', '--ignore-eos', '--print-ids', '--max-total-tokens', '8192']
    out = subprocess.run(base, capture_output=True, text=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    same += got == t['greedy']
    k = next((i for i, (a, b) in enumerate(zip(got, t['greedy'])) if a != b), None)
    first_diff.append(k)
    spec = subprocess.run(base + ['--speculative-algorithm', 'EAGLE3', '--speculative-draft-model-path', 'models/pycoder-eagle3',
                                  '--speculative-num-steps', '3', '--spec-trace', '/tmp/tr.json'], capture_output=True, text=True)
    if spec.returncode != 0:
        print('spec generate failed:', spec.stderr[-3000:]); sys.exit(1)
    sg = json.loads(spec.stdout.strip().splitlines()[-1])
    eager = subprocess.run(base + ['--enforce-eager'], capture_output=True, text=True)
    ge = json.loads(eager.stdout.strip().splitlines()[-1])
    print(f"  graphs vs eager greedy identical: {ge == got}")
    tr = json.load(open('/tmp/tr.json'))
    acc_gpu.append(sum(i['accepted'] + 1 for i in tr['iterations']) / len(tr['iterations']))
    acc_cpu.append(sum(i['accepted'] + 1 for i in t['iterations']) / len(t['iterations']))
    print(f"prompt {len(t['prompt'])} tok: gpu greedy == cpu golden: {got == t['greedy']} (first diff at {k}); "
          f"spec == plain gpu: {sg == got}; accepted/verify gpu {acc_gpu[-1]:.2f} cpu {acc_cpu[-1]:.2f}")
print(f"mean accepted length per verify: gpu {sum(acc_gpu)/len(acc_gpu):.3f} cpu {sum(acc_cpu)/len(acc_cpu):.3f}")
