#include "launcher/config/metrics_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdlib>

namespace dflash {

bool ValidMetricsAddress(const std::string& address, std::string* err) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    *err = "no port: write IP:PORT (port 0 takes a free one)";
    return false;
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::atoi(port.c_str()) > 65535) {
    *err = "port \"" + port + "\" is not a number from 0 to 65535";
    return false;
  }
  unsigned char buf[sizeof(in6_addr)];
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    if (::inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) == 1) return true;
    *err = "\"" + host + "\" is not an IPv6 address";
    return false;
  }
  if (::inet_pton(AF_INET, host.c_str(), buf) == 1) return true;
  *err = "\"" + host + "\" is not an IPv4 address (a name is not resolved; IPv6 goes in brackets: [::1]:0)";
  return false;
}

}  // namespace dflash
