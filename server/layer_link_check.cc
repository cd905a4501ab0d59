// The empty program each layer's library is linked into, whole, with only the layers it may
// use (server/CMakeLists.txt): a call into any other layer is an undefined reference there.
int main() { return 0; }
