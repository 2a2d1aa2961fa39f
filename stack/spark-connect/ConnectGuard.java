// Authentication for a Spark Connect 3.5 server, which has none of its own: every call must
// carry the header `x-cdclake-token` equal to the server's CDCLAKE_CONNECT_TOKEN (a client
// sends it as `sc://host:port/;x-cdclake-token=<token>`), and, unless CDCLAKE_CONNECT_PEERS
// is `any`, come from a loopback address (the server takes a port, no host, and listens on
// every interface). Loaded by the server through spark.connect.grpc.interceptor.classes.
package cdclake;

import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import org.sparkproject.connect.grpc.Grpc;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.ServerCall;
import org.sparkproject.connect.grpc.ServerCallHandler;
import org.sparkproject.connect.grpc.ServerInterceptor;
import org.sparkproject.connect.grpc.Status;

public class ConnectGuard implements ServerInterceptor {
  static final Metadata.Key<String> TOKEN =
      Metadata.Key.of("x-cdclake-token", Metadata.ASCII_STRING_MARSHALLER);
  private final byte[] expected;
  private final boolean anyPeer;

  public ConnectGuard() {
    String token = System.getenv("CDCLAKE_CONNECT_TOKEN");
    if (token == null || token.length() < 16) {
      throw new IllegalStateException("CDCLAKE_CONNECT_TOKEN must hold a token of 16 characters or more");
    }
    expected = token.getBytes(StandardCharsets.UTF_8);
    anyPeer = "any".equals(System.getenv("CDCLAKE_CONNECT_PEERS"));
  }

  @Override
  public <Q, R> ServerCall.Listener<Q> interceptCall(
      ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
    SocketAddress peer = call.getAttributes().get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR);
    boolean loopback = peer instanceof InetSocketAddress
        && ((InetSocketAddress) peer).getAddress() != null
        && ((InetSocketAddress) peer).getAddress().isLoopbackAddress();
    if (!anyPeer && !loopback) {
      call.close(Status.PERMISSION_DENIED.withDescription(
          "this Spark Connect server takes calls from its own host only"), new Metadata());
      return new ServerCall.Listener<Q>() {};
    }
    String given = headers.get(TOKEN);
    byte[] bytes = given == null ? new byte[0] : given.getBytes(StandardCharsets.UTF_8);
    if (!MessageDigest.isEqual(bytes, expected)) {
      call.close(Status.UNAUTHENTICATED.withDescription(
          "missing or wrong x-cdclake-token"), new Metadata());
      return new ServerCall.Listener<Q>() {};
    }
    return next.startCall(call, headers);
  }
}
