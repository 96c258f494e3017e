"""Launchers: where the ranks of a job run, behind one protocol (`base`): `local` (this machine, through
mpirun, or horovodrun for Gloo and elastic jobs) and `kubernetes` (a cluster, as an MPIJob; `kubeclient`
reaches it, `logview` draws its log). `progress` draws rank 0's events for both. What runs inside a job's
pods: `workers` (the launcher's wait for its workers' sshd), `discovery` (an elastic job's hosts),
`memlock` (the RDMA precondition); `procs` finds a local launch's rank processes."""
