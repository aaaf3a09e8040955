"""Outside the runtime path: `mover demo` and the throwaway local server it and the tests use."""
