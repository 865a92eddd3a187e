"""Array kernels of legionpy's operators: pure functions, numpy or cupy.

Every function works on whole arrays or on tiles; it infers the array module
from its arguments (:func:`array_module`), so one source serves CPU and GPU.
Families: :mod:`.conv`, :mod:`.pool`, :mod:`.dense`, :mod:`.activation`,
:mod:`.norm`, :mod:`.random` (dropout), :mod:`.loss`, :mod:`.tensor`,
:mod:`.embedding`, :mod:`.rnn`, :mod:`.attention`; :mod:`.tiling` says which
input tile and padding a conv/pool output tile needs.
"""

from __future__ import annotations

from .activation import *  # noqa: F403
from .activation import __all__ as _activation_all
from .attention import *  # noqa: F403
from .attention import __all__ as _attention_all
from .common import *  # noqa: F403
from .common import __all__ as _common_all
from .conv import *  # noqa: F403
from .conv import __all__ as _conv_all
from .dense import *  # noqa: F403
from .dense import __all__ as _dense_all
from .embedding import *  # noqa: F403
from .embedding import __all__ as _embedding_all
from .loss import *  # noqa: F403
from .loss import __all__ as _loss_all
from .norm import *  # noqa: F403
from .norm import __all__ as _norm_all
from .pool import *  # noqa: F403
from .pool import __all__ as _pool_all
from .random import *  # noqa: F403
from .random import __all__ as _random_all
from .rnn import *  # noqa: F403
from .rnn import __all__ as _rnn_all
from .tensor import *  # noqa: F403
from .tensor import __all__ as _tensor_all
from .tiling import *  # noqa: F403
from .tiling import __all__ as _tiling_all

__all__ = [
    *_activation_all,
    *_attention_all,
    *_common_all,
    *_conv_all,
    *_dense_all,
    *_embedding_all,
    *_loss_all,
    *_norm_all,
    *_pool_all,
    *_random_all,
    *_rnn_all,
    *_tensor_all,
    *_tiling_all,
]
