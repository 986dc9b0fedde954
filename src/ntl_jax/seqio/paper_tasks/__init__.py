"""SeqIO tasks for the paper's datasets beyond the mathematics data (registered on
import): GSM8K (`gsm8k`), rJokes (`rjokes`) and MultiRC (`multirc`), each read from the
dataset's own files, which are never downloaded here: each module says where they come
from and which environment variable names their directory.
"""

from ntl_jax.seqio.paper_tasks import gsm8k, multirc, rjokes

REGISTERED: tuple[str, ...] = tuple(gsm8k.register() + rjokes.register() + multirc.register())
