"""hvdk8s's version, in a module of its own: the job-file models name the default image by it, and the
package's __init__ (which reads them) re-exports it."""
__version__ = "0.1.0"
