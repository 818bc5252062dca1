#!/usr/bin/env bash
# Every benchmark of docs/performance.md, one JSON line each. Run by hand: bash bench/run_all.sh
set -euo pipefail
cd "$(dirname "$0")"
python cpu.py ..                      # CPU per request of this checkout (name others to compare side by side)
python cpu.py .. --callgrind 600      # instructions per request, steady state
python journal.py
python saturation.py --concurrency 64 --latency 0.1 --window 20
python saturation.py --concurrency 64 --latency 0.1 --window 20 --reward exact
python saturation.py --concurrency 512 --latency 1 --window 30
python saturation.py --concurrency 2048 --latency 4 --window 40
python saturation.py --concurrency 64 --latency 0 --window 15
python saturation.py --auto --capacity 160 --latency 1 --window 30
python saturation.py --concurrency 64 --capacity 160 --latency 1 --window 20
python transport.py --concurrency 64 --latency 0.1 --requests 3000
python ceiling.py --concurrency 64 --latency 0.1 --rounds 100
python ceiling.py --concurrency 512 --latency 1 --rounds 20
python ceiling.py --concurrency 2048 --latency 4 --rounds 10
python ceiling.py --concurrency 64 --latency 0 --rounds 200
python memory_startup.py
python openai_baseline.py --concurrency 64 --latency 0.1
python math_checks.py --checks 20000
python math_checks.py --real --checks 1000
