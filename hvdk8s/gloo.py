"""How long the ranks of an elastic job wait in Gloo's rendezvous and collectives: one value for both back
ends (the local launch and the rendered MPIJob), passed to horovodrun as --gloo-timeout-seconds.

Horovod's default is 30 s. A rank that joins must start Python, import its framework and reach hvd.init while
the others wait in the rendezvous; on a busy node that passed 30 s (a TensorFlow rank joining a local job
beside the test suite, and a worker pod on a loaded node), and a rank that times out takes its own host out
of the job. Raised as other Horovod deployments do (Determined: 240 s); the cost: a peer that hangs without
closing its connections is noticed this late (a deleted pod's or a killed process's close at once)."""

GLOO_TIMEOUT_SECONDS = 120
