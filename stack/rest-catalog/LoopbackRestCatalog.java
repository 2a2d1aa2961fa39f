// Apache Iceberg's REST catalog server (RESTCatalogServer, iceberg-open-api's test fixtures)
// listening on 127.0.0.1 only: the catalog, adapter and servlet its start() builds, with
// Jetty's connector given the loopback host before it binds (start() takes a port only, so
// the server listens on every interface). Configured as RESTCatalogServer is, by CATALOG_*
// variables. Run by cdclake_local.rest_catalog with Java's source launcher.
import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServer;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;

public class LoopbackRestCatalog {
  public static void main(String[] args) throws Exception {
    Constructor<RESTCatalogServer> make = RESTCatalogServer.class.getDeclaredConstructor();
    make.setAccessible(true);
    Method backend = RESTCatalogServer.class.getDeclaredMethod("initializeBackendCatalog");
    backend.setAccessible(true);
    Object context = backend.invoke(make.newInstance());
    Constructor<?> adapterMake = Class.forName("org.apache.iceberg.rest.RESTServerCatalogAdapter")
        .getDeclaredConstructor(context.getClass());
    adapterMake.setAccessible(true);
    RESTCatalogAdapter adapter = (RESTCatalogAdapter) adapterMake.newInstance(context);

    ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    handler.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    handler.insertHandler(new GzipHandler());
    Server http = new Server();
    ServerConnector connector = new ServerConnector(http);
    connector.setHost("127.0.0.1");
    connector.setPort(Integer.parseInt(System.getenv().getOrDefault("CATALOG_REST_PORT", "8181")));
    http.addConnector(connector);
    http.setHandler(handler);
    http.start();
    http.join();
  }
}
