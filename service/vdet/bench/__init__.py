"""The benchmarks an operator runs (`vdet bench pipeline|engine|tracking|serve`), each result with
the machine it ran on (`environment`) and one definition of a percentile (`stats`). Only the CLI
imports this package; the lab's investigations live outside it, in a checkout's bench/."""
