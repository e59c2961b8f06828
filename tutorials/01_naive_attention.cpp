#include <kvlab/kvlab.hpp>
int main() { return 0; }
