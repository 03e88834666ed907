"""Built-in task kits: templates and word lists in ``headscope/data/tasks/<kit>.json`` (each file
records where its contents came from), filled in for one model's tokenizer, seeded. A kit is one
module here plus one :func:`register` line below (``docs/develop/add-task-kit.md``).

==========  ========================================================================================
base        the kit type and the registry; drawing a kit's pairs; reading the task a user names
ioi         Wang et al.'s indirect-object identification: BABA and ABBA templates, ABC corruption
capital     a country's capital city
pronoun     the pronoun of a name said earlier
copy_name   a surname said once, copied after the first name
==========  ========================================================================================
"""

from headscope.probes.kits import capital, copy_name, ioi, pronoun
from headscope.probes.kits.base import (
    DATA,
    KITS,
    N_PAIRS,
    Kit,
    check_task,
    fill,
    held_out_task,
    is_task_file,
    kit_data,
    load_kit,
    register,
    resolve_task,
    single_token_words,
    tokenize_task,
)

register(ioi.KIT)
register(capital.KIT)
register(pronoun.KIT)
register(copy_name.KIT)

__all__ = [
    "DATA",
    "KITS",
    "N_PAIRS",
    "Kit",
    "check_task",
    "fill",
    "held_out_task",
    "is_task_file",
    "kit_data",
    "load_kit",
    "register",
    "resolve_task",
    "single_token_words",
    "tokenize_task",
]
