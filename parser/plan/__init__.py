"""Capacity planner: predict a ParSer deployment's latency, throughput, cache memory and GPU count.

    parser plan                  # plan a deployment (configs/plan/plan.yaml)
    parser plan calibrate        # measure a backend's rates -> a rates file
    parser plan validate         # calibrate here, predict, run for real, compare
    parser plan table2           # fit the paper's Table 2 short lengths, predict 896K

Modules: `memory` (cache bytes per resident chunk prefix, from config.json), `rates` (a server's
cost model, fitted from measurements), `simulate` (simpy discrete-event simulation of episodes
and of MemAgent's sequential reading), `planner` (tables, GPU sweep, plot), `calibrate`,
`validate`, `table2`. See docs/scaling.md.
"""
