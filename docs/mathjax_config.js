// MathJax 2's settings for the docs (Doxygen's MATHJAX_CODEFILE): no "Loading ..." message box in
// the corner while it typesets.
MathJax.Hub.Config({ messageStyle: "none" });
